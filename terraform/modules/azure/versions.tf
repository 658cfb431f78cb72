terraform {
  required_version = ">= 1.5.0"
  required_providers {
    azurerm = {
      source = "hashicorp/azurerm"
      # 4.9 added storage_account_id to azurerm_storage_container.
      version = ">= 4.9.0, < 5.0.0"
    }
  }
}
